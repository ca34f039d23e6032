"""Where santa writes: URIs local or S3 (storage), run folders (layout), the one-writer locks (runlock), outputs published whole (outputs)."""
