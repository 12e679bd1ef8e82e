"""Generation: the vLLM generator actor and its HTTP twin, the fleet that owns and replaces them,
the weight-transfer engine the generators load new versions through, and vLLM's worker
extension.

Imports only :mod:`agentrl.engine.common`.
"""
