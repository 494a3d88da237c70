"""Implement the functions below; tests/test_visible.py shows what is expected."""


def caesar(text: str) -> str:
    """Shift every ASCII letter 16 places forward in the alphabet, wrapping around and keeping its case; leave every other character as it is."""
    raise NotImplementedError


def run_length(text: str) -> str:
    """Encode each run of one repeated character as the character, ':' and the run's length, runs joined by ','; the empty string encodes as ''. Example: 'aab' -> 'a:2,b:1'."""
    raise NotImplementedError


def balanced(text: str) -> bool:
    """Whether the brackets (), [] and {} in text are balanced and properly nested; other characters are ignored."""
    raise NotImplementedError
