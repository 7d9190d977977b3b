"""Data: chat-format JSONL samples to token ids with placeholder spans, packing, collation."""
