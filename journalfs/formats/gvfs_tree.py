"""Placeholder until the codec lands."""
from .base import Codec


class GvfsTree(Codec):
    name = "GvfsTree"

    def sniff(self, head):
        return False
