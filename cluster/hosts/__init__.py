"""What pscluster does on a host, through its transport: ``hostops`` (the client of the shipped
``roles/hostctl.py`` agent), ``preflight`` (facts and the pure checks on them), ``codesync``
(manifests and copies), ``firewall`` (nftables rulesets), ``gpus`` (``nvidia-smi`` and masks) and
``probe`` (the one grpcio user: is a TensorFlow server answering)."""
