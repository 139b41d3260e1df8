"""Notifications of a job's state changes: the notifier that delivers them from background threads
(:mod:`.notifier`). The URL rules it shares with the inventory, the plan and the console are
cluster/urls.py, which imports no thread."""
