"""Getting the node probe onto a node and reading it back: exec in the standing agent, the debug
pod and its namespace, the probe as a local child process, the log/exec stream and the record
decoder that validates what comes back.
"""
