"""Large-content transfer service for AI agents.

Layers (see DESIGN.md): ``transfer.core`` (pure protocol logic), ``transfer.service`` (every operation, once),
``transfer.api`` (HTTP front door), ``transfer.client`` (async/sync client and resolver), ``transfer.cli``.
"""

__version__ = "0.1.0"
