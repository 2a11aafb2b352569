"""Process nodes: test-bed Nodes whose pods run as processes of this machine.

:mod:`.agent` is the node agent (a kubelet of our own, started as a test-bed component with
``up --process-node``); :mod:`.podspec` and :mod:`.podstatus` decide what a pod's containers run
and what is reported (pure); :mod:`.network` gives each pod a network namespace, an address in
link-local space and names in its ``/etc/hosts``; :mod:`.sandbox` runs one container in the
pod's namespaces; :mod:`.images` is the image map; :mod:`.component` is the agent's
test-bed row and removes everything it made on ``down``. See docs/testbed.md, "Process nodes".
"""
