"""emitters package."""
