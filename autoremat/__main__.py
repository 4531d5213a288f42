"""`python -m autoremat ...`: the command line (see `autoremat.cli`)."""

from autoremat._xla import configure_cpu_flags

configure_cpu_flags()  # before JAX initializes its backend (docs/FACTS.md fact 4)

from autoremat.cli import main  # noqa: E402

if __name__ == "__main__":
    main(prog_name="autoremat")
