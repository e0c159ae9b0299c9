#!/bin/sh
# Initialise the data directory on first start, then run mariadbd in the foreground with an
# init file that creates the database and users named by the MARIADB_* variables (idempotent).
set -eu
DB=${MARIADB_DATABASE:-test}
mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
if [ ! -d /var/lib/mysql/mysql ]; then
  chown mysql:mysql /var/lib/mysql
  mariadb-install-db --user=mysql --datadir=/var/lib/mysql --skip-test-db >/dev/null
fi
cat >/run/mysqld/init.sql <<SQL
CREATE DATABASE IF NOT EXISTS \`$DB\`;
CREATE USER IF NOT EXISTS '${MARIADB_USER:-user}'@'%' IDENTIFIED BY '${MARIADB_PASSWORD:-}';
GRANT ALL ON \`$DB\`.* TO '${MARIADB_USER:-user}'@'%';
CREATE USER IF NOT EXISTS 'root'@'%' IDENTIFIED BY '${MARIADB_ROOT_PASSWORD:-}';
GRANT ALL ON *.* TO 'root'@'%' WITH GRANT OPTION;
SQL
chown mysql /run/mysqld/init.sql
exec mariadbd --user=mysql --datadir=/var/lib/mysql --bind-address=0.0.0.0 \
  --init-file=/run/mysqld/init.sql "$@"
