"""Consistency under chaos: worker processes, a chaos controller and a checker.

``python -m tests.consistency --seconds 600`` runs a soak; see :mod:`.runner`.
"""
