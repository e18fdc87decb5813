terraform {
  # terraform_data (1.4) is built in: this environment needs no provider at all.
  # 1.9: validation conditions may refer to other variables.
  required_version = ">= 1.9"
}
