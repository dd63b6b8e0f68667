from pardiag.cli import main

main()
