from picoclaw.cli import main

raise SystemExit(main())
