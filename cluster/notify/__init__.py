"""Notifications of a job's state changes: the URL rules, pure (:mod:`.urls`: which URL may be a
target, and the URL as shown anywhere), and the notifier that delivers from background threads
(:mod:`.notifier`).

This file imports nothing, so that the inventory, the plan and the console, which import
:mod:`.urls`, never import the notifier's threads (tests/unit/test_house.py holds that)."""
