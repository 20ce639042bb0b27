from frscope.cli import main

raise SystemExit(main())
