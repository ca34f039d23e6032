"""The dual encoder, its backbones and tokenizer, checkpoint loading, and batch encoding."""
