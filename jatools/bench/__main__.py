from jatools.bench.runner import main

raise SystemExit(main())
