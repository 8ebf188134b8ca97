"""costmodel package."""
