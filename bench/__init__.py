"""genaug's benchmarks: one package, run from the repository root (not installed).

    python -m bench --help                  # every benchmark, one line each, by family
    python -m bench pool_latency --quick    # = python -m bench.pool.pool_latency --quick
    python -m bench all [--quick]           # the service and pool ones (make bench)

Families are the packages here: ``service/``, ``pool/``, ``training/``, ``gain/``, ``gpu/``.
Each benchmark module has ``run(argv) -> dict`` and ends with ``main(run)``
(:mod:`bench.harness`: the contract, arguments, tables); :mod:`bench.services` starts child
services, :mod:`bench.serve` is their entry point for settings the CLI has no flag for, and
:mod:`bench.run_all` runs the service and pool families in turn. Add one by copying a
neighbour in its family: ``--help`` lists it from its docstring's first line.
"""
