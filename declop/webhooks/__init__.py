"""Admission and conversion webhooks: declared in Python, served over HTTPS, registered in the cluster.

Owns the declaration of a webhook (and ``Rejected``), parsing AdmissionReview and ConversionReview
and building their answers, the JSON patch a mutator's edit becomes, the HTTPS server, the
certificate authority and serving certificates it generates or mounts, and the
Validating/MutatingWebhookConfiguration and CRD conversion stanzas it applies. May import
everything below it: the base modules, ``declop.kube``, ``declop.cache`` and ``declop.serving``.
"""
