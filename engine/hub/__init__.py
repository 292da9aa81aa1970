"""Where models come from: Hugging Face Hub pulls and the built-in demo."""
