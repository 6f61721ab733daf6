"""Security: authentication and transport security (listeners and their security protocols, TLS
contexts and certificate principals, the SASL exchange with PLAIN and SCRAM-SHA-256/512, the
SCRAM credential store) and authorization (the ACL model, the authorizer and the ACL store).

Sans-IO where it can be: the SASL state machine, SCRAM and PLAIN verification, principal mapping,
listener parsing and the authorizer do no I/O; ``tls`` reads key and certificate files,
``credentials`` and ``acl_store`` write their files."""
