"""The residual-split pack: conversion, its identity, checksums and cost."""
