"""`python -m hybridflow.convert`: the conversions of hybridflow.convert (see its module docstring)."""

from hybridflow.convert import main

raise SystemExit(main())
