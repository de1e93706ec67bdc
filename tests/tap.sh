#!/bin/sh
# tap.sh — placeholder
