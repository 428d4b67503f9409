"""What the extender knows of the cluster: the usage cache (nodes, the pods that count, assumptions of its
own decisions, the fit memo), where a pod's state comes from, informer wiring, read-backs of writes whose
outcome is unknown, the record of recent decisions, busy nodes and the background repairs.

May import: ``scheduler.core``, ``hami_agent.protocol``, ``hami_agent.k8s``. Not the verbs or the HTTP face.
"""
