"""The `rlhfkit` program. ``main.py`` reads argv, prints the usage and version lines, shows the commands' log
messages on stderr and turns an error into one line and an exit status, running the commands of
``rlhfkit.commands``; ``reference.py`` generates the option tables of docs/cli.md from the same configs. This is
the top of the package: the library (the Python API included) never imports it."""
