"""What runs on the job's host, inside the job, with the host's own python3 (3.6 and
later, stdlib only): task 0's teardown, the node memory it keeps, and the drain poller.

Submit copies these files, with their one helper module, beside run.json; the batch
script runs them there after checking their owner and mode. They import nothing of this
package (the host need not have it), and anything in the package may import them.
"""
