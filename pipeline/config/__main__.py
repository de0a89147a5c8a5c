"""``python -m pipeline.config > docs/config.md``: print the configuration reference."""

from .docs_reference import reference_markdown

print(reference_markdown())
