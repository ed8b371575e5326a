from declop.cli import main

main()
