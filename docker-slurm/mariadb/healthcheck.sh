#!/bin/sh
# Healthy once the server answers a query as the application user over TCP (the init file
# has run by then). The official image's flags (--connect --innodb_initialized) are ignored.
exec mariadb -h 127.0.0.1 -u"${MARIADB_USER:-root}" -p"${MARIADB_PASSWORD:-$MARIADB_ROOT_PASSWORD}" \
  -e 'SELECT 1' >/dev/null 2>&1
