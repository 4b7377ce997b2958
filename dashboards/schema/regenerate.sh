#!/usr/bin/env bash
# Regenerates the pinned Grafana dashboard JSON schemas in this directory from the npm
# package @grafana/schema (TypeScript types) with ts-json-schema-generator.
#
#   bash dashboards/schema/regenerate.sh            # rewrite the committed schemas
#   GRAFANA_SCHEMA_VERSION=13.3.0 bash ...          # move the pin (then update source.json's
#                                                   # consumers: dashboards are regenerated
#                                                   # by `kvobs dashboards`)
#
# Output: dashboard.schema.json (the classic dashboard model: panels, rows, templating),
# panels/<type>.options.schema.json and panels/<type>.fieldconfig.schema.json for each
# panel type the kvobs dashboards use (Panel.options and fieldConfig.defaults.custom are
# free-form in the dashboard model; these make them strict too), and source.json with
# the pinned versions and Grafana's current schemaVersion (read from the package).
set -euo pipefail

GRAFANA_SCHEMA_VERSION="${GRAFANA_SCHEMA_VERSION:-13.2.3}"
GENERATOR_VERSION="${GENERATOR_VERSION:-2.10.0}"
PANEL_TYPES=(timeseries stat heatmap xychart)

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

cd "$WORK"
npm init -y >/dev/null
npm install --no-audit --no-fund --silent \
    "@grafana/schema@${GRAFANA_SCHEMA_VERSION}" "ts-json-schema-generator@${GENERATOR_VERSION}"

TYPES="node_modules/@grafana/schema/dist/types"
generate() {  # generate <d.ts file> <type name> <output file>
    npx --no-install ts-json-schema-generator --no-type-check \
        --path "$1" --type "$2" --out "$3.tmp"
    # Stable, diff-friendly formatting.
    node -e 'const fs=require("fs");const f=process.argv[1];
             fs.writeFileSync(f.slice(0,-4), JSON.stringify(JSON.parse(fs.readFileSync(f)),null,2)+"\n");
             fs.unlinkSync(f)' "$3.tmp"
}

mkdir -p "$HERE/panels"
generate "$TYPES/raw/dashboard/x/types.gen.d.ts" Dashboard "$HERE/dashboard.schema.json"
for panel in "${PANEL_TYPES[@]}"; do
    cfg="$TYPES/raw/composable/$panel/panelcfg/x/types.gen.d.ts"
    generate "$cfg" Options "$HERE/panels/$panel.options.schema.json"
    generate "$cfg" FieldConfig "$HERE/panels/$panel.fieldconfig.schema.json"
done

# Grafana's current schemaVersion is the default the package's dashboard kind declares.
SCHEMA_VERSION="$(grep -ho 'schemaVersion: [0-9]*' node_modules/@grafana/schema/dist/esm/raw/dashboard/x/types.gen.mjs | head -n1 | grep -o '[0-9]*')"
cat > "$HERE/source.json" <<JSON
{
  "package": "@grafana/schema",
  "version": "${GRAFANA_SCHEMA_VERSION}",
  "generator": "ts-json-schema-generator@${GENERATOR_VERSION}",
  "schemaVersion": ${SCHEMA_VERSION},
  "panelTypes": [$(printf '"%s", ' "${PANEL_TYPES[@]}" | sed 's/, $//')]
}
JSON
echo "schemas for @grafana/schema ${GRAFANA_SCHEMA_VERSION} (schemaVersion ${SCHEMA_VERSION}) written to $HERE"
