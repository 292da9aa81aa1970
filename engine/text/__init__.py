"""Text in and out: tokenizers (BPE, SentencePiece), the pre-tokenizer, chat templates."""
