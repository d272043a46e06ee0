"""Text of conversations: chat templates and training masks, tool-call parsing, prompt normalising."""
