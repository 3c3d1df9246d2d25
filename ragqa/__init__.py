"""ragqa: the command line, above everything it wires together.

The layers, each importing only those below it::

    ragqa (the CLI)
    serve, evals
    ingest
    rag (the core)
"""
