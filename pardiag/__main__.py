from pardiag.cli import main

raise SystemExit(main())
