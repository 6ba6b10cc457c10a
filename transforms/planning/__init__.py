"""Planners: from a target (central epsilon, delta, error, budget over windows) to a mechanism and its parameters.

Pure numpy/scipy like ``privacy`` and ``mechanisms``, the two packages they combine; nothing else imports both.
"""
