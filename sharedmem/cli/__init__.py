"""The command line: the parser, output helpers, the client's and the server's commands, doctor and demo."""
