"""Placeholder until the codec lands."""
from .base import Codec


class Jrnl(Codec):
    name = "Jrnl"

    def sniff(self, head):
        return False
