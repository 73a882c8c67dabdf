"""The Hugging Face Hub: pull and upload."""
