"""Placeholder until the codec lands."""
from .base import Codec


class GvfsJournal(Codec):
    name = "GvfsJournal"

    def sniff(self, head):
        return False
