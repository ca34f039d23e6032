"""The method's parts: entity extraction, masking, ASST sub-trees, losses, the global batch."""
