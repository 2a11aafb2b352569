"""The training lifecycle: submit or adopt, admission, monitoring, diagnosis, retry, cancel."""
