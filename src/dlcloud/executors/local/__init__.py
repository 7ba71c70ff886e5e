"""The local executor: each attempt runs on this host under a detached, standard-library-only launcher.

``executor.py`` holds ``LocalExecutor`` (runs in the control plane); ``launcher.py`` runs as its own process
per attempt and must never import dlcloud. The attempt directory's files are the only interface between them.
"""
