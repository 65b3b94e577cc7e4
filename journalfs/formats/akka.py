"""Placeholder until the codec lands."""
from .base import Codec


class AkkaData(Codec):
    name = "AkkaData"

    def sniff(self, head):
        return False


class AkkaMeta(Codec):
    name = "AkkaMeta"

    def sniff(self, head):
        return False
