from bookkeeper_py.admin.cli import main

main()
