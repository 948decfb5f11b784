from diagnoser.cli import main

raise SystemExit(main())
