"""The benchmarks and helper scripts of the checkout (not shipped: the wheel holds ``graphstore`` only).

Each tool runs as a script, ``python tools/<name>.py ...`` from the repository root, and
imports as a module, ``from tools import <name>`` (tests). Shared pieces live in
`tools.benchkit`: disk timing with ``dd``, ``/proc`` counters, the cgroup memory cap and
``run_capped``, the machine record, ``median_range``, JSON results, dropping the page cache.

A tool imports a sibling as trainers/ imports ``common``::

    try:
        from tools import benchkit
    except ImportError:  # run as a script: its own folder, tools/, is on sys.path
        import benchkit

Run as a script, ``sys.path[0]`` is this folder, so the bare name resolves; imported as
``tools.<name>`` the package import does. Either way the sibling is a module of its own file,
loaded once, with no ``importlib`` path tricks.
"""
