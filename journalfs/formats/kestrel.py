"""Placeholder until the codec lands."""
from .base import Codec


class KestrelReader(Codec):
    name = "KestrelReader"

    def sniff(self, head):
        return False


class KestrelWriter(Codec):
    name = "KestrelWriter"

    def sniff(self, head):
        return False
