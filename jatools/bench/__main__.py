from jatools.bench.harness import main

raise SystemExit(main())
