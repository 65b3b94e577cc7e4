"""Placeholder until the codec lands."""
from .base import Codec


class WallabyIndex(Codec):
    name = "WallabyIndex"

    def sniff(self, head):
        return False


class WallabyLog(Codec):
    name = "WallabyLog"

    def sniff(self, head):
        return False
