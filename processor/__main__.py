from processor.cli.main import main

main()
