"""The faiss index every room retrieves with (evaluation, mining, search)."""
