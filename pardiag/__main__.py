from pardiag.cli import run

run()
