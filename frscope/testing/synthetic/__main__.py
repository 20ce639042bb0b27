"""`python -m frscope.testing.synthetic`: see the package's doc."""

from frscope.testing.synthetic.command_line import main

raise SystemExit(main())
