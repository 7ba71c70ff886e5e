"""The ``dlcloud`` command line (Typer + Rich). Every command goes through the SDK (dlcloud.client);
heavy modules are imported inside commands so ``dlcloud --help`` stays fast.
"""
